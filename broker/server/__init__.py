"""The asyncio side: listener, reader (one Protocol per connection), writer, channel tasks."""
