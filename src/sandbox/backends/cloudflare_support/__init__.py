"""Protocol pieces of the `cloudflare` backend that are worth testing on their own."""
