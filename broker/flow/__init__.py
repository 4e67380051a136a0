"""Back-pressure: task mailboxes, credit flow between actors, memory and disk monitors, alarms."""
