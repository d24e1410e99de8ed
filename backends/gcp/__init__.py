"""Google Cloud: Vertex AI training jobs over a Cloud Storage bucket (offers priced from the catalog)."""
