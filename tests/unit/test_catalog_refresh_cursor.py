from speechdata.catalog.refresh_cursor import (
    RETRY_BASE_S,
    RETRY_MAX_S,
    RefreshCursor,
    RunOutcome,
    decide_refresh,
)


def test_the_cursor_moves_only_when_the_requested_refresh_succeeded():
    requested = decide_refresh(RefreshCursor(), latest=7, outcome=None, now=0.0)
    assert requested.run_key == "catalog-7" and requested.cursor.covered == 0
    running = decide_refresh(requested.cursor, latest=9, outcome=RunOutcome.PENDING, now=1.0)
    assert running.run_key is None and running.cursor == requested.cursor
    done = decide_refresh(requested.cursor, latest=9, outcome=RunOutcome.SUCCEEDED, now=2.0)
    # 7 is covered; 9 came after the refresh was requested, so it gets its own.
    assert done.cursor.covered == 7 and done.run_key == "catalog-9"
    covered = decide_refresh(done.cursor, latest=9, outcome=RunOutcome.SUCCEEDED, now=3.0)
    assert covered.run_key is None and covered.cursor == RefreshCursor(covered=9)


def test_failed_refreshes_are_asked_for_again_with_a_growing_wait():
    cursor = decide_refresh(RefreshCursor(covered=3), latest=5, outcome=None, now=0.0).cursor
    now, keys, waits = 0.0, [], []
    for _ in range(10):
        failed = decide_refresh(cursor, latest=5, outcome=RunOutcome.FAILED, now=now)
        assert failed.cursor.covered == 3
        waits.append(failed.cursor.retry_after - now)
        if failed.run_key is None:
            assert "failed in a row" in failed.reason
            now = failed.cursor.retry_after
            failed = decide_refresh(failed.cursor, latest=5, outcome=None, now=now)
        keys.append(failed.run_key)
        cursor = failed.cursor
    assert waits[:4] == [0.0, RETRY_BASE_S, 2 * RETRY_BASE_S, 4 * RETRY_BASE_S]
    assert max(waits) == RETRY_MAX_S
    assert len(set(keys)) == len(keys) and keys[0] == "catalog-5-retry-1"
    succeeded = decide_refresh(cursor, latest=5, outcome=RunOutcome.SUCCEEDED, now=now)
    assert succeeded.cursor == RefreshCursor(covered=5) and succeeded.run_key is None


def test_a_cursor_stored_before_is_what_it_covered():
    assert RefreshCursor.from_json("42") == RefreshCursor(covered=42)
    assert RefreshCursor.from_json(None) == RefreshCursor()
    cursor = RefreshCursor(covered=1, requested=4, run_key="catalog-4", failures=2, retry_after=9.5)
    assert RefreshCursor.from_json(cursor.to_json()) == cursor
