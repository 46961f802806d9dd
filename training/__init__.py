"""What a run needs besides the network and the data.

- trainer.py: the training loop, its checkpoint state (``state_dict``) and resumption
- data.py: what the trainer trains on, text or synthetic tasks behind one interface
- validation.py: the validation losses (text windows, task answers)
- run_dir.py: the run directory, the one owner of every path inside a run
- run_lock.py: one training per run directory, on one machine or across a cluster's hosts
- slurm.py: this process's Slurm job, and the state of jobs by id (squeue, sacct)
- checkpoint.py: atomic checkpoints, safe loading
- saved_run.py: a trained model, its config and tokenizer, rebuilt from a run directory
- runtime.py: device, precision, the data-parallel group, MFU peaks and timing
- optim.py: AdamW groups and the warmup + cosine schedule
- metrics.py: metrics.jsonl, the progress bar and wandb
- provenance.py: the git commit results are recorded with
- hf_directory.py: export to / import from Hugging Face transformers directories
"""
