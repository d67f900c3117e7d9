<?php
// GET with a query string: echo what lsphp derived from the env and the header index.
echo "method=", $_SERVER['REQUEST_METHOD'], "\n";
echo "query=", $_SERVER['QUERY_STRING'], "\n";
echo "script_name=", $_SERVER['SCRIPT_NAME'], "\n";
echo "host=", $_SERVER['HTTP_HOST'], "\n";
echo "user_agent=", $_SERVER['HTTP_USER_AGENT'], "\n";
ksort($_GET);
foreach ($_GET as $k => $v) {
    echo "get[$k]=$v\n";
}
