# The corral Rack launcher: being written.
abort "the Rack launcher is not written yet"
