"""Local servers for the cloud backends' tests (each cloud's own `<cloud>_server.py`) and the runners that play
each training service (`<cloud>_runner.py`)."""
