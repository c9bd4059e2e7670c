//! A reverse Polish notation calculator for a command-line tool: "3 4 + 2 *" is 14.

#[derive(Debug, PartialEq)]
pub enum Error {
    /// An operator found fewer than two numbers on the stack.
    StackUnderflow,
    /// A token that is neither a number nor an operator.
    UnknownToken(String),
    /// Division by zero.
    DivisionByZero,
    /// The expression left no number, or more than one.
    BadExpression,
}

/// Evaluates a whitespace-separated RPN expression of integers and + - * /.
pub fn eval(expr: &str) -> Result<i64, Error> {
    let mut stack: Vec<i64> = Vec::new();
    for token in expr.split_whitespace() {
        if let Ok(n) = token.parse::<i64>() {
            stack.push(n);
            continue;
        }
        let a = stack.pop().ok_or(Error::StackUnderflow)?;
        let b = stack.pop().ok_or(Error::StackUnderflow)?;
        let value = match token {
            "+" => a + b,
            "-" => a - b,
            "*" => a * b,
            "/" => {
                if a == 0 {
                    return Err(Error::DivisionByZero);
                }
                a / b
            }
            other => return Err(Error::UnknownToken(other.to_string())),
        };
        stack.push(value);
    }
    match stack.as_slice() {
        [n] => Ok(*n),
        _ => Err(Error::BadExpression),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_and_multiplies() {
        assert_eq!(eval("3 4 + 2 *"), Ok(14));
    }

    #[test]
    fn subtracts_in_written_order() {
        assert_eq!(eval("10 3 -"), Ok(7));
    }

    #[test]
    fn divides_in_written_order() {
        assert_eq!(eval("20 4 /"), Ok(5));
    }

    #[test]
    fn division_by_zero_is_an_error() {
        assert_eq!(eval("1 0 /"), Err(Error::DivisionByZero));
    }

    #[test]
    fn errors() {
        assert_eq!(eval("1 +"), Err(Error::StackUnderflow));
        assert_eq!(eval("1 2 x"), Err(Error::UnknownToken("x".into())));
        assert_eq!(eval("1 2"), Err(Error::BadExpression));
    }
}
