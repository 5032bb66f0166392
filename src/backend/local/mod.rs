//! The local backend: lease state in files under a directory, for processes on one host.
