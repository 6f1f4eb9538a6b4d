"""What a person sees and types: the config file, crontab lines, the live view
and plain log lines, status and plan, reports, one `submit` from lock to exit code, the
flags' meanings and the Typer commands.

May import: every lower wing.
"""
