"""The backend: built-in policy, tasks, the GRPO loop, metrics, the run store and the runner."""
