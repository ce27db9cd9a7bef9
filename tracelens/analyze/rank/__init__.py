"""One rank's own timeline: event classes, the step breakdown, GPU idle time and its causes, launch links,
step windows, host stalls, HTA's breakdown."""
