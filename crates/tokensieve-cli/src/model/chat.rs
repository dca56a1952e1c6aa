//! `--chat`: the prompt as one user message, formatted by the model's own chat template
//! (`tokenizer.chat_template`, Jinja) the way Hugging Face transformers' `apply_chat_template`
//! renders it: `trim_blocks` and `lstrip_blocks` on, `messages`, `add_generation_prompt = true`,
//! `bos_token` / `eos_token`, `raise_exception`, and Python's string methods (`strip`,
//! `startswith`, …). For SmolLM2 this is ChatML with the template's default system message.

use anyhow::{anyhow, Result};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};
use std::collections::BTreeMap;

/// One chat message.
pub struct Message<'a> {
    /// `system`, `user` or `assistant`.
    pub role: &'a str,
    /// The text.
    pub content: &'a str,
}

/// Renders `template` for `messages`, ending with the prompt of the assistant's turn.
pub fn render(template: &str, messages: &[Message<'_>], bos_token: &str, eos_token: &str) -> Result<String> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| anyhow!("chat template: {e}"))?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, message))
    });
    let template =
        env.template_from_str(template).map_err(|e| anyhow!("the model's chat template does not parse: {e}"))?;
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| {
            Value::from(BTreeMap::from([
                ("role".to_string(), Value::from(m.role)),
                ("content".to_string(), Value::from(m.content)),
            ]))
        })
        .collect();
    let ctx = BTreeMap::from([
        ("messages".to_string(), Value::from(messages)),
        ("add_generation_prompt".to_string(), Value::from(true)),
        ("bos_token".to_string(), Value::from(bos_token)),
        ("eos_token".to_string(), Value::from(eos_token)),
    ]);
    template.render(Value::from(ctx)).map_err(|e| anyhow!("the model's chat template failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as embedded in its GGUF file.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_is_chatml_with_a_default_system_message() {
        let user = [Message { role: "user", content: "Hi!" }];
        assert_eq!(
            render(SMOLLM2, &user, "<|im_start|>", "<|im_end|>").unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
        let with_system = [Message { role: "system", content: "Be brief." }, Message { role: "user", content: "Hi!" }];
        assert_eq!(
            render(SMOLLM2, &with_system, "", "").unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_style_templates_render() {
        let t = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n\
                 {{ m['content'] | trim }}<|eot_id|>{% endfor %}\
                 {% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
        let out = render(t, &[Message { role: "user", content: " Hi " }], "<|begin_of_text|>", "").unwrap();
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception_work() {
        let t = "{% if messages[0]['content'].strip().startswith('x') %}{{ raise_exception('no x') }}{% endif %}ok";
        assert_eq!(render(t, &[Message { role: "user", content: " a" }], "", "").unwrap(), "ok");
        let e = render(t, &[Message { role: "user", content: " x" }], "", "").unwrap_err().to_string();
        assert!(e.contains("no x"), "{e}");
        assert!(render("{% if %}", &[], "", "").is_err());
    }
}
