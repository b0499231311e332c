"""Analysis of logged runs: MLflow / snapshot → tidy table → figures, Table 1, report.

Modules: ``runs`` (loading, snapshots, SweepInfo: I/O only), ``metric_names`` (eval-metric
names, units, labels), ``arms`` (techniques per arm, which arms to compare), ``stats``
(bootstrap over seeds), ``figures`` (paper Figs. 1–7), ``tables`` (Table 1, comparisons),
``report`` (CLI).
Nothing here imports torch or vllm; import the submodule you need.
"""
