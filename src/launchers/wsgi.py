# The corral WSGI launcher: being written.
import sys
sys.exit("the WSGI launcher is not written yet")
