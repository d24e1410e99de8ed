"""Local stand-ins for the clouds (one server module, runner and conftest per cloud), with real SDK clients."""
