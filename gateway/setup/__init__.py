"""``speclane init``: read real endpoints and write a starter policy from what they show."""
