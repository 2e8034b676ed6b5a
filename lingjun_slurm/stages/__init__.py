"""The one entry command of the built-in stages, the path every rendered script calls:

    python3 -m lingjun_slurm.stages STAGE --plan PLAN.json ...

It stays at this path across releases (rendered scripts, docs and users call it); the stages
themselves live in the job-side wing, lingjun_slurm/injob/stages/ (dispatch.py reads the
arguments and the plan and hands over to the stage's module). Standard library only: it runs
on the batch host outside the container too (the image stage, the pre-flight's judge).
"""
