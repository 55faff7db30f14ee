"""Scripts run by ``.venv-nemo``'s Python (tests/nemo_env.py): NeMo's own code reading our outputs.

Each takes the path of the JSON file to write its result to, then its own arguments.
"""
