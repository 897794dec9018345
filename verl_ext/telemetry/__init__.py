"""What the check produces, made durable: ``tito/`` metrics for verl's tracker and per-rollout JSONL records."""
