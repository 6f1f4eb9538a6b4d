"""What a person sees and types: the config file, crontab lines, the live view
and plain log lines, reports of what `query` reads, the flags' meanings and the
Typer commands.

May import: every lower wing.
"""
