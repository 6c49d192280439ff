"""The web console (SPEC §19): pages served at /ui/ that call the /v1 API with a session cookie."""
