"""The Google Cloud SDKs, imported only when called, so the backend imports without the `gcp` extra."""


def aiplatform():
    from google.cloud import aiplatform

    return aiplatform


def storage():
    from google.cloud import storage

    return storage
