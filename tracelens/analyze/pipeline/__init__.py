"""Pipeline parallelism: bubbles per stage, the schedule and its expectation, stage composition and layer
work, the timeline's blocks, schedule and layout what-ifs."""
