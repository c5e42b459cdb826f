"""The read-only web console (``ferry console``): cluster, topics, consumer groups, messages, charts."""
