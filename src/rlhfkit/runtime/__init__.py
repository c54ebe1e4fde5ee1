"""Where the code meets the machine: device, precision, attention kernels and the speed-ups chosen once at start-up."""
