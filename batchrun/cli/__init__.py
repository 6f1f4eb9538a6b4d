"""What a person sees and types: the config file, crontab lines, the live view
and plain log lines, status and plan, reports, the flags' meanings and the Typer
commands.

May import: every lower wing.
"""
