# source me: makes python/pytest import THIS worktree's code, not /work/main's editable install
cd /work/wt/h-cost
export PYTHONPATH=/work/wt/h-cost/functions:/work/wt/h-cost
export PATH=/work/main/.venv/bin:$PATH
export PYTHONDONTWRITEBYTECODE=1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
