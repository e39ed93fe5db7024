"""The scheduler: heartbeat and cron jobs on APScheduler, each fire run once across replicas.

Modules, from what a person types to a finished run:

- ``crontab.py``       crontab expressions (5 fields, @-aliases) as APScheduler triggers.
- ``schedules.py``     at / in / every / cron schedules, fire-time arithmetic, durations,
                       the clock and ``CronError`` (the base of every cron error).
- ``jobs.py``          ``CronJob`` and ``RunRecord``; building a job from CLI/tool input;
                       back-off and auto-disable after a run (``apply_run``).
- ``store.py``         the scheduler's Redis: jobs, fire claims, the run ledger, run-now.
- ``fires.py``         one fire: its RunRequest, handing it to the runner, ``CronFires``.
- ``heartbeat.py``     the heartbeat: active hours, HEARTBEAT.md, ``HeartbeatFires``.
- ``service.py``       ``SchedulerService``: APScheduler, catch-up, keeping replicas in step.
- ``ports.py``         what the scheduler needs from the daemon (runner, pub/sub listener,
                       key names, owner-checked deletes).
- ``settings.py``      heartbeat and scheduler settings.
- ``cron_tool.py``     the agent's ``cron`` tool; ``cron_commands.py`` the ``botd cron`` CLI.

The scheduler imports only ``agent``; the daemon passes everything else in.
"""
