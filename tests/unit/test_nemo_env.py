"""The NeMo side of a test fails, never skips, when .venv-nemo is missing, and says what builds it."""

import pytest

import tests.nemo_env as nemo_env


def test_a_missing_nemo_environment_fails_and_names_make_nemo_env(tmp_path, monkeypatch):
    monkeypatch.setattr(nemo_env, "NEMO_ENV_STAMP", tmp_path / ".venv-nemo" / ".installed")
    with pytest.raises(pytest.fail.Exception, match="`make nemo-env` creates it"):
        nemo_env.run_in_nemo_env("viterbi_reference.py", str(tmp_path / "cases.pt"))


@pytest.mark.slow
def test_a_failing_nemo_script_fails_with_its_stderr(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"viterbi_reference\.py in .*exited 1") as caught:
        nemo_env.run_in_nemo_env("viterbi_reference.py", str(tmp_path / "no-such-cases.pt"))
    assert "no-such-cases.pt" in str(caught.value)
