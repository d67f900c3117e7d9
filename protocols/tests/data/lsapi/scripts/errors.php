<?php
// error_log() goes to the server as STDERR_STREAM; a 404 with two Set-Cookie headers.
error_log("corral capture: something went wrong");
http_response_code(404);
header('Set-Cookie: first=1; Path=/', false);
header('Set-Cookie: second=2; HttpOnly', false);
echo "not found\n";
