"""`kubectl modelroll`: its command line, the plans it patches by, its analysis commands."""
