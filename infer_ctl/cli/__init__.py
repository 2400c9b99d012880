"""The `infer-ctl` command line."""
