"""Tracking: the MLflow run of a training run (tracker: buffered, exactly-once logging, run names,
the store's checks) and the tracking server a cluster's nodes log to (mlflow_server)."""
