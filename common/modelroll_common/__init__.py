"""What modelroll's gateway and operator share: command-line flag helpers and the API connection."""
