"""The grammar service: spec -> compiled grammar through the memory LRU, the disk cache and the compile workers."""
