"""Sample shards and corpora built from the committed recordings, for the demo and the tests."""
