"""Offline evaluation over BEIR-layout datasets: pipelines run, scored and compared (`hybrid eval`)."""
