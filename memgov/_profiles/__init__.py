"""What jobs used: the profile store, job ids, sizing ``auto`` claims from them."""
