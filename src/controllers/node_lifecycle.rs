pub async fn run(_client: kube::Client) {}
