from web_env.server.app import main

main()
