# source me: makes python/pytest import THIS worktree's code, not /work/main's editable install
cd /work/wt/h-sched
export PYTHONPATH=/work/wt/h-sched/functions:/work/wt/h-sched
export PATH=/work/main/.venv/bin:$PATH
export PYTHONDONTWRITEBYTECODE=1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
