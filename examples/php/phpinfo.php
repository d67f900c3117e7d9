<?php
// Everything PHP knows about this request and its worker: SAPI, CGI variables, extensions.
phpinfo();
