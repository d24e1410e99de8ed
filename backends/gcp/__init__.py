"""Google Cloud: Vertex AI custom jobs staged through Cloud Storage (the managed backend); offers from the price catalog."""
