"""Run records: each submission's directory, its manifest.json, and the user's index of runs."""
