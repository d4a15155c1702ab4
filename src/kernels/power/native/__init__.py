"""The C++ launcher of the attention form (launcher.py builds native_launch.cpp once per machine): short sequences
pay no Python launch overhead once a specialization's kernels are known."""
