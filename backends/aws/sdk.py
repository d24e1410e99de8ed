"""The AWS SDK, imported only when called, so the backend imports without the `aws` extra."""


def boto3():
    import boto3

    return boto3
