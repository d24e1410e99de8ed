"""Azure: Azure ML command jobs staged through a Blob container (backend.py); offers from the price catalog."""
