"""Tests of snerd.io, the trio shell: real files, real file descriptors, some real daemons."""
