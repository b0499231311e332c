"""Data: what a run reads and how it is scored.

    readers   JSONL / parquet / HF-dir rows, counted by reason when bad
    prompts   the chat template and the prompt of one example; LoadReport
    datasets  the registry of shipped and user datasets (files/ holds the shipped ones)
    sampler   the resumable prompt sampler
    minitask  the arithmetic task of the mini reproduction (no dapo imports)
    rewards   rule-based scoring (math-verify in a worker process)
    run_data  the datasets and reward of one run, from its config
"""
