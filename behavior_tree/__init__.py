"""behavior_tree package."""
