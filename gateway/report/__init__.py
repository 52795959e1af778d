"""``speclane report``: the pilot report over request records, per slice and arm."""
