"""AWS: SageMaker training jobs over S3 (the managed backend, `backend.AwsBackend`); offers from the price catalog."""
