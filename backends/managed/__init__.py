"""What the three managed training services share: an object store, a training service, one backend over both."""
