"""Back-pressure: credit flow between actors, memory and disk monitors, resource alarms."""
