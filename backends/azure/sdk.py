"""The Azure SDKs, imported only when called, so the backend imports without the `azure` extra."""


def ml():
    import azure.ai.ml

    return azure.ai.ml


def identity():
    import azure.identity

    return azure.identity


def blob():
    import azure.storage.blob

    return azure.storage.blob
