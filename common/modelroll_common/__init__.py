"""What modelroll's components share: the HTTP server, command-line flag helpers, the table of
sidecar settings a ModelVersion tunes, and the API connection."""
