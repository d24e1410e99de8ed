"""The Bittensor SDK, imported only when called, so the backend imports without the `bittensor` extra."""


def bittensor():
    import bittensor

    return bittensor
