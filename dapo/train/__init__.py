"""Training: one run, the loop of Algorithm 1 and its phases.

    loop        train(): the loop, one named call per phase; main() is `dapo train`
    rollout     steps 1-3: prompts, generation, scoring, shaping, dynamic sampling
    behaviour   step 5: π_old and π_rollout, a registry of modes
    logprobs    the trainer's forwards: log-probs and entropies of a batch
    update      step 6: mini-batches, micro-batches, the optimizer steps
    staleness   train.staleness = k: the lagged weights that sample
    evaluate    avg/pass/cons@k on the eval sets, per-sample records
    checkpoint  save, verify, resume (checksums, the fallback to an intact one)

``python -m dapo.train EXP.yaml`` is ``dapo train`` (what ``accelerate launch`` starts).
"""
